"""Walkthroughs: notebooks executed with papermill and exported as HTML that reads offline
(`execute`, `export`), their parameters (`parameters`) and formulas as MathML (`math`).
`mtwork run` (cli.py) is made of these."""
