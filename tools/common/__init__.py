"""Helpers the other tools share: a throwaway server to measure, a host over a tokenizer alone."""
