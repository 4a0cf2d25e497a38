"""One module per engine, each with its EngineDescription (adapters.contract) and its Engine class."""
