-- The least a warden node needs in PostgreSQL: a login role that owns one
-- schema, and nothing else. Run it as a superuser (or the database's
-- owner), connected to the database the nodes will use:
--
--   psql -d warden -f deploy/postgres/warden-role.sql
--   psql -d warden -c "ALTER ROLE warden PASSWORD 'a long random secret'"
--
-- and give the nodes --store 'postgres://warden:SECRET@db:5432/warden?sslmode=require&sslrootcert=/etc/warden/db-ca.pem'.
--
-- What warden does with it: on start it creates and migrates its tables
-- (warden_sessions, warden_nodes, warden_conversations,
-- warden_conversation_turns, warden_turns, warden_turn_events and its
-- migration table) in the role's schema, under an advisory lock; then it
-- reads and writes those tables only. It needs no superuser, no CREATEDB,
-- no access to other schemas, no extension.

CREATE ROLE warden LOGIN;

DO $$
BEGIN
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO warden', current_database());
    -- Unqualified names resolve to the role's own schema.
    EXECUTE format('ALTER ROLE warden IN DATABASE %I SET search_path = warden', current_database());
END
$$;

CREATE SCHEMA warden AUTHORIZATION warden;

-- Nothing in public for anyone (PostgreSQL 15's default; older versions
-- let every role create there).
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
