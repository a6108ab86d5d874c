"""Token-exact prompt building from a model's own chat template, for text and for images."""
