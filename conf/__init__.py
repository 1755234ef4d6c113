"""Hydra configuration (YAML files); a package so it ships inside wheels and FABs."""
