require("spec.conformance.run")("bwrap_direct")
