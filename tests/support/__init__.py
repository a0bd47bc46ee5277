"""Helpers shared by the tests: real servers, paged test batches, a stand-in executor, chart checks."""
