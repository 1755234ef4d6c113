"""Math several methods share: weighted aggregation, model distances and similarities, clustering.

Plain functions on arrays (no Flower types), each unit-tested with hand-worked numbers.
"""
