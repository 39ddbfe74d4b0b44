"""maka-eval: reproducible, fair and safe AI-agent benchmark experiments."""

__version__ = "0.1.0"
