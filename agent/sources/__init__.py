"""Where artifact jobs fetch files from (the Hub layout first)."""
