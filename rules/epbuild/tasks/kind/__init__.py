"""One module per task kind (`tasks.kinds` lists them): the generator's doc, what it wants, how it makes its task
dicts. Each has `tasks(source, ...)`, the generator doit is handed (`source`: the run's `tasks.definitions.Tasks`,
which holds what every kind shares: the project, the selection, how a task dict is spelled); a kind whose tasks do
work also has `make(source, item)`, one task from its build, stage or package, which a selecting run calls alone."""
