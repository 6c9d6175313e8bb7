"""Item pipelines, in order: clean -> validate -> dedupe -> store. One component per file."""
