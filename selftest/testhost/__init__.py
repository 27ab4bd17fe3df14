"""The test host `spark01` (see spark01.py and README.md)."""
