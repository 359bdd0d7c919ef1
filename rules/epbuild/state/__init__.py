"""epbuild.state: what epbuild remembers between runs, every file under `artifacts/.state/` (`registry`: the table
of docs/state.md), read and written through one interface (`folder.StateFolder`)."""
