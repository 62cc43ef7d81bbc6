"""Result files of other benchmark clients, read and written so their runs sit beside vlmserve's.

`vllm_bench` is the `vllm bench serve --save-result` format (written by `bench --result-format
vllm`, read by `runs import`); `aiperf` reads AIPerf's `profile_export_aiperf.json`; `importer`
recognises a file, turns it into a RunResult marked with the tool that made it, and stores it.
"""
