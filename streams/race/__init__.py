"""RACE sketches (Coleman & Shrivastava 2021): LSH families, counting kernels, the mergeable
sketch, KDE queries, private releases, the sketch wire format and the applications.
"""
