"""sparkgate: acceptance tests that tell an operator whether an LLM serving box is fit to serve."""

__version__ = "0.1.0"
