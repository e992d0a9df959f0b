"""A market run: its phases from ingest to report, on Ray, and several requests in one run."""
