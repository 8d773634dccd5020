require("spec.conformance.run")("modal")
