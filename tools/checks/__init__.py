"""Checks outside the test suite: tokenizers, template families, the canvas read on a GPU, the package's structure."""
