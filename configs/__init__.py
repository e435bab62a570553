"""Predefined search spaces and example configs (YAML), shipped as package data."""
