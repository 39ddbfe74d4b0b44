"""The maka-eval command line."""
