require("spec.conformance.run")("safehouse")
