-- Runs busted inside sbxlua, so specs exercise the real C modules and the
-- embedded library; each spec runs in sbxlua's root task.
require("busted.runner")({ standalone = false })
