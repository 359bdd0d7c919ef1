"""Using what a build made: an artifact opened as an application opens it (`session`), and `epbuild run`
(`run`). Reads only what the artifact folder says (artifact.json), never the manifest's build settings."""
