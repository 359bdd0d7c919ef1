"""What persists: the artifacts layout, atomic publishing, the artifact cache (local and remote), file hashes,
the external-data index, the settings record."""
