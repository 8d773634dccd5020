--- base64 (RFC 4648, with padding): encode(s) -> text; decode(text) ->
--- bytes | nil, why. Provider scripts get it as `base64`; the docker backend
--- reads the engine's path stats with it.
local B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
local DEC = {}
for i = 1, 64 do DEC[B64:byte(i)] = i - 1 end
local function b64encode(s)
  local out, n = {}, #s
  for i = 1, n, 3 do
    local a, b, c = s:byte(i, i + 2)
    local v = (a << 16) | ((b or 0) << 8) | (c or 0)
    out[#out + 1] = string.char(B64:byte((v >> 18) + 1), B64:byte(((v >> 12) & 63) + 1),
                                b and B64:byte(((v >> 6) & 63) + 1) or 61, c and B64:byte((v & 63) + 1) or 61)
  end
  return table.concat(out)
end
local function b64decode(s)
  s = s:gsub("[%s]", "")
  if #s % 4 ~= 0 then return nil, "base64: length is not a multiple of 4" end
  local out = {}
  for i = 1, #s, 4 do
    local c1, c2, c3, c4 = s:byte(i, i + 3)
    local a, b = DEC[c1], DEC[c2]
    local c, d = c3 == 61 and 0 or DEC[c3], c4 == 61 and 0 or DEC[c4]
    if not (a and b and c and d) or (c3 == 61 and c4 ~= 61) or ((c3 == 61 or c4 == 61) and i + 3 < #s) then
      return nil, "base64: invalid input at byte " .. i
    end
    local v = (a << 18) | (b << 12) | (c << 6) | d
    out[#out + 1] = string.char(v >> 16, (v >> 8) & 255, v & 255):sub(1, c3 == 61 and 1 or c4 == 61 and 2 or 3)
  end
  return table.concat(out)
end
return { encode = b64encode, decode = b64decode }
