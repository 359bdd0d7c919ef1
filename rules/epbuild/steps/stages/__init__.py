"""The stages that can run before a compile, one module each, every one a `run(job)` on the stage's child
(`steps.preprocess`, which reads its request, dispatches by kind through `runners.RUNNERS` and checks what it
wrote): `upgrade` (ONNX's version converter), `freeze` (configuration inputs made constants), `shape` (static
shapes), `fold` (constant subgraphs folded), `rewrite` (known patterns rewritten), `optimize` (ONNX Runtime's offline
optimization), `quantize` (QDQ with calibration data), `squash` (external data inlined). A `StageJob` is what each is
given (`contracts.jobs.StageJob`), `output` how each writes. Nothing is imported here: the build process imports
`output` for its own work and runs no stage itself."""
