"""Measuring the decision path: speed, bulk, soak, startup and refusal times."""
