"""Plans: which engine configurations run which requests, with which resources; all a worker needs, resolved once from
the loaded scenario."""
