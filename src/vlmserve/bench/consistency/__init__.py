"""`vlmserve consistency`: do answers stay the same under load?

Silent wrong answers under batching or caching are a recurring class of engine bugs; for a
VLM the worst case is an image cache serving another request's image. This check sends a
fixed set of temperature-0 requests alone, then the same requests inside concurrent load,
and compares the answers token by token (`cases` builds what is sent, `runner` sends it,
`compare` judges, `console` shows). docs/consistency.md describes it.
"""
