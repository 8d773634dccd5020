-- The conformance suite on the local backend (always available).
require("spec.conformance.suite")("local", {}, _ENV)
