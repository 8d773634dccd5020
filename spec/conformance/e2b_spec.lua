require("spec.conformance.run")("e2b")
