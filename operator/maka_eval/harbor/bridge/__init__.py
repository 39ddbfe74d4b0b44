"""What maka-eval runs inside Harbor's own Python environment (stdlib and Harbor only).

maka-eval copies this folder (with `strict_json.py`) into a private folder as the
package `maka_eval_harbor` and puts that folder on Harbor's PYTHONPATH: maka-eval's own
package and its dependencies never enter Harbor's interpreter.
"""
