--- Warm sources: where routing finds sandboxes made ahead of time (sbx.pool's
--- open pools register through router.add_warm_source). routing/decide.lua
--- counts them for the policy and takes from them for a route.
local M = {}

-- Where routing finds sandboxes made ahead of time (sbx.pool's open pools).
local warm_sources = {}

---Let routing take warm sandboxes from `src`: src.count(opts) -> { [backend]
---= n } of sandboxes matching the request (nil or empty: none);
---src.take(backend, opts, peek) -> sb, how | nil (with `peek`: only how,
---nothing handed out).
function M.add(src)
  assert(type(src) == "table" and type(src.count) == "function" and type(src.take) == "function",
         "add_warm_source: expected { count = fn, take = fn }")
  warm_sources[#warm_sources + 1] = src
end

-- backend -> warm sandboxes matching `opts`, summed over the sources (nil
-- when there is no source).
function M.count(opts)
  if #warm_sources == 1 then return warm_sources[1].count(opts) or {} end
  if #warm_sources == 0 then return nil end
  local out = {}
  for _, src in ipairs(warm_sources) do
    for name, n in pairs(src.count(opts) or {}) do out[name] = (out[name] or 0) + n end
  end
  return out
end

-- The first source's matching warm sandbox on `backend`: sb, how (peek: how).
function M.take(backend, opts, peek)
  for _, src in ipairs(warm_sources) do
    local sb, how = src.take(backend, opts, peek)
    if sb then return sb, how end
  end
  return nil
end

return M
