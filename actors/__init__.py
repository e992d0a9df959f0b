"""The runtime: transports, actors, the market run, configuration, command line and reports."""
