"""One-pass record streams: decoders, file tailers, LSH families and the RACE sketch.

Pure like ``dpmarket.protocol`` except ``tail.py`` (asyncio + files) and ``records.py`` (files).
"""
