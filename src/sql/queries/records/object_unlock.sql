-- $1 object, $2 token. Lets go of the object's lease when the token holds it.
UPDATE {objects} SET token = NULL, lease_until = NULL
WHERE object = $1 AND token = $2
