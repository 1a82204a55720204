"""Set-up: environments, the models the tests and the README serve, checkpoint converters."""
