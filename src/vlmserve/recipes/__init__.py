"""Model recipes: the vLLM flags each VLM family needs, laid under the user's own flags.

A family's serving page (parsers, multimodal limits, vision budget, async scheduling) is knowledge a
team otherwise re-types per deployment and gets subtly wrong. `families` holds that knowledge keyed
by config.json's `model_type`/`architectures`; `model_config` finds a model's config.json;
`resolve` lays the recipe under the user's flags (the user wins) and drops what the installed vLLM
lacks; `apply` does that for a deployment spec (`vlmserve up`). docs/recipes.md has the sources.
"""
