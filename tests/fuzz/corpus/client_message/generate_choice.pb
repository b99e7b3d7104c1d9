abHŠ
red
green