from epbuild.dodo import *  # noqa: F403 - every task of models.toml: `doit`, `doit list`, `doit compile:MODEL@TARGET`
