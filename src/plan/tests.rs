//! Unit tests for the scanner and the parser internals.
