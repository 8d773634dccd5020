require("spec.conformance.run")("bwrap")
