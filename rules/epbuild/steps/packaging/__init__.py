"""What ships: model packages, shared-context loading contracts, genai folders."""
