"""One module per command of the ``dpmarket`` CLI (main.py assembles the parser). Commands
parse arguments, call the runtime or the sans-I/O core, and print; they hold no protocol.
"""
