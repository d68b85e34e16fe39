"""The stage contract: typed config, document schema, passes and markers, stage declarations, the registry and runner."""
