k	"'

system	Be brief.

userHi thereX‚7{"type":"object","properties":{"a":{"type":"integer"}}}˜ô