"""Sans-I/O core of dpmarket: wire messages, privacy mechanisms and party state machines.

Pure Python + numpy. Nothing here imports ray or asyncio, opens files or sockets, or reads a
clock; randomness and deadlines are passed in.
"""
