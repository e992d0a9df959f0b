"""Configuration: a run's TOML parsed and checked once, into immutable inputs."""
