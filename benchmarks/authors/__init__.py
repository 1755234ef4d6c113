"""The papers' own code run beside pflower: recipes (``*.md``) and the scripts they use."""
