"""The steps that turn a model into an artifact: the stages before a compile (static shapes, optimization,
quantization, freezing, squashing), the compile itself (one module per compiler), the checks of what it wrote,
and validation. Their job modules run in children (`epbuild.execute.child`)."""
