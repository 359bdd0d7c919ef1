"""The doit layer, the only package that knows doit: `project` loads a manifest into what task creation needs
(`Project`), `definitions` turns it into doit's task dicts and settings, `actions` are the tasks' actions,
`commands` the inspecting tasks (backends, cache, graph, prune), `checker` doit's file checker and `reporter` its
console output and the reports.

Task creation reads the manifest, a cached host probe and a cached external-data index; it never imports
onnxruntime or parses an unchanged model, so `doit list` and a no-op `doit` stay near doit's own cost. Actions are
thin: they call plain functions (`steps.compile`, `steps.validate`, `steps.preprocess`,
`steps.toolchain.toolchains`), print one line and return the values the build report keeps.
"""
