"""Wire models: the only place request, response, error and event shapes are defined."""
