"""The manifest: its schema, parsing, the EP table, target resolution and the resulting builds."""
