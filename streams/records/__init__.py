"""Records arriving in one pass: the public schema, text and msgpack decoders, the one module
that opens files (files.py) and the tailer that follows them (tail.py, the only asyncio user).
"""
