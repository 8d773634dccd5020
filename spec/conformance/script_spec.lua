require("spec.conformance.run")("script")
