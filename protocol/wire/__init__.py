"""The wire format: the msgpack codec with its evolution rules, value checks, the error
hierarchy and the helpers every sans-I/O party uses to dispatch and address messages.
Imports no other protocol subpackage.
"""
