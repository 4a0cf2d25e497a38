"""Localisation: teacher-forced per-layer traces compared against a measured noise floor, and the verdict on where and
why two engines part."""
