"""One module per engine; `registry` maps engine names to them with lazy imports."""
